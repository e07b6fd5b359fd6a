"""The local environment: a real Temporal dev server and kwok-run Kubernetes clusters on 127.0.0.1."""
