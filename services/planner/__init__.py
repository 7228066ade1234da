"""The SLO planner: sizes the prefill and decode worker groups from TTFT/TPOT.

`policy` decides (pure), `prometheus` reads the signals, `kube` writes the RayCluster's
worker groups, `drain` turns a decrease into drained, named victims (`ray_workers` reads and
drains the workers), `loop` ties one evaluation together for `dspark-serve planner`.
"""
