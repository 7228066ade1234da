"""The SLO planner: sizes the prefill and decode worker groups from TTFT/TPOT.

`policy` decides (pure), `prometheus` reads the signals, `kube` writes the RayCluster's
worker-group replicas, `loop` ties one evaluation together for `dspark-serve planner`.
"""
