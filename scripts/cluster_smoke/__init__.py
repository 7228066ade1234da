"""`make cluster-smoke`: the CPU image's four pods (Ray head, prefill and decode workers, gateway)
started on one host exactly as the Helm chart renders them for profiles/cpu-dev.yaml, with what
KubeRay and the kubelet add emulated; see docs/kubernetes.md ("Cluster smoke test")."""
