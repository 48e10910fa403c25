"""The kubelet pod-resources v1 API (vendored api.proto) and its generated stubs; needs the k8s extra."""
