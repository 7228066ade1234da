"""Ray workers that hold the engine: PrefillWorker, DecodeWorker, colocated Worker.

How outputs reach the gateway. Each worker runs its EngineCore's step loop on one thread
(`EngineLoop`); every step's outputs go into per-gateway buffers (`Outbox`). The gateway
keeps one long poll open per worker (`poll(consumer, timeout)`), which returns as soon as a
step produced something for it and carries everything produced since the previous poll. The
cost is one RPC per step per worker, whatever the number of requests (measured against one
Ray streaming generator per request in `services.bench.transport`: 4 ms against 106 ms mean
delivery latency at 32 concurrent requests on 2 CPU cores). Memory stays bounded: a gateway
that stops polling for `consumer_lease_s` has its requests aborted and its buffer dropped.

How a dead worker is noticed. A worker's actor dies -> the pending long poll fails at once;
it stops answering -> the periodic stats call times out; it restarted -> its `instance_id`
changed. Any of these marks it down at the gateway, which fails the requests it held with an
error, routes around it, and puts it back once it answers again.

Disaggregation. A prefill worker exports a request's KV right after the engine reports its
hand-off and publishes a `TransferTicket` with the first token; the gateway streams the token
and asks a decode worker to `receive_kv(ticket)`, which fetches the KV (bounded by a timeout)
and installs it in its engine (`KVTransfer`, services/workers/transfer.py).
"""
