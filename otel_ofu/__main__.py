from otel_ofu.cli.main import main

raise SystemExit(main())
