"""Prefixes computed once: which queued request should wait for another's prefill.

Requests that arrive together often share a long prefix (a system prompt, the history of
a multi-turn session), and none of it is in the prefix cache yet. Admitted together, each
would compute it. Instead (SGLang's in-batch prefix deferral) a queued request whose
prefix a prefilling request is still computing stays queued; the prefilling request hands
its launched pages to the cache chunk by chunk (KVManager.share_computed), and the queued
one is admitted once the cache holds the shared part, computing only what follows it.
"""

from __future__ import annotations

from engine.kv.manager import KVManager
from engine.kv.token_prefix import common_prefix_len
from engine.request import Request

# Shared prefixes shorter than this are computed twice rather than waited for: a step's delay
# is not worth a few tokens of compute (SGLang's threshold is 32 as well).
MIN_DEFERRED_TOKENS = 32


def computing_elsewhere(kv: KVManager, fill_ids: list[int], prefilling: list[Request]) -> bool:
    """Whether a request about to be admitted with `fill_ids` shares a prefix of at least
    MIN_DEFERRED_TOKENS with a prefilling request that has not launched all of it yet, past
    what the cache holds. Such a request should wait: once those pages are launched they
    are in the cache and it attaches to them, computing none of the prefix."""
    if not kv.caches_prefixes or not prefilling:
        return False
    cached = kv.cached_prefix_len(fill_ids)
    page = kv.page_size
    lookup = len(fill_ids) - 1  # an admission keeps one token to compute (KVManager.admit)
    for other in prefilling:
        shared = min(common_prefix_len(fill_ids, other.fill_ids), lookup)
        shared -= shared % page
        if shared >= MIN_DEFERRED_TOKENS and shared > cached and other.num_computed < shared:
            return True
    return False
