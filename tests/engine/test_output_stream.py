"""A request's outputs carry its tokens once: each step's new tokens in `new_token_ids`, and
all of them again only on the output that ends the request (`token_ids`), so that a long
stream does not copy and send its whole output every step."""

from __future__ import annotations

from engine.sampling_params import SamplingParams
from tests.engine.engine_driver import run


def test_only_the_last_output_repeats_every_token(make_tiny_engine):
    engine = make_tiny_engine()
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    (finished,) = run(engine, [[1, 5, 7, 9]], params)
    *streaming, last = finished.outputs
    assert len(streaming) >= 2
    assert all(out.token_ids == () and not out.finished for out in streaming)
    assert last.finished and last.finish_reason == "length"
    assert list(last.token_ids) == [t for out in finished.outputs for t in out.new_token_ids]
    assert len(last.token_ids) == 12
