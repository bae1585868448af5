"""Generated stubs for the kubelet pod-resources API v1 (see podresources_v1.proto, generate.py)."""
