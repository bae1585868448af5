from otel_ofu.cli import main

raise SystemExit(main())
