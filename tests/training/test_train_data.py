"""The prompt set, sequence shards, the batch sampler and answer generation."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from train_helpers import EOS, WordTokenizer, tiny_target, tiny_target_config

from training.batches import BatchSampler, pad_batch
from training.data import NOT_TARGET_OUTPUT, SequenceSet, ShardStore, corpus_sequences
from training.generate import (
    DenseGenerator,
    GenerationPlan,
    generate_dataset,
    job_seed,
    missing_chunks,
    plan_jobs,
)
from training.prompts import build_prompt_set
from training.teacher import run_teacher


def test_prompt_set_is_large_varied_deterministic_and_split_by_hash() -> None:
    everything = build_prompt_set(100_000, seed=0)
    assert len(everything) > 7000
    assert len({p.key for p in everything}) == len(everything)
    prompts = build_prompt_set(3000, seed=0)
    assert [p.key for p in prompts] == [p.key for p in build_prompt_set(3000, seed=0)]
    assert [p.key for p in prompts[:500]] == [p.key for p in build_prompt_set(500, seed=0)]  # a prefix
    assert [p.key for p in build_prompt_set(300, seed=1)] != [p.key for p in prompts[:300]]
    domains = collections.Counter(p.domain for p in prompts)
    for domain in (
        "coding",
        "math",
        "explain",
        "howto",
        "creative",
        "summary",
        "list",
        "dialogue",
        "tool-call",
        "json",
        "multi-turn",
        "translate",
        "email",
    ):
        assert domains[domain] >= 10, domain
    assert max(domains.values()) < 0.25 * len(prompts)
    assert any(len(p.turns) == 3 and p.turns[1][0] == "assistant" for p in prompts)
    heldout = [p for p in prompts if p.is_heldout(30)]
    assert 0.015 * len(prompts) < len(heldout) < 0.05 * len(prompts)
    # The split depends on the text only.
    assert {p.key for p in heldout} <= {p.key for p in everything if p.is_heldout(30)}


def test_shards_round_trip_and_refuse_other_settings(tmp_path) -> None:
    seqs = SequenceSet.from_lists(
        [[1, 2, 3], [4, 5], [6, 7, 8, 9]], [1, 1, 0], [0.0, 0.7, NOT_TARGET_OUTPUT], [False, True, False]
    )
    store = ShardStore(tmp_path / "data")
    store.write("gen-00000", seqs)
    store.write("gen-00001", seqs.subset(np.array([2])))
    loaded = store.load_all()
    assert len(loaded) == 4 and loaded.num_tokens == 13
    assert loaded.sequence(3).tolist() == [6, 7, 8, 9] and loaded.sequence(1).tolist() == [4, 5]
    assert loaded.split(heldout=True).sequence(0).tolist() == [4, 5]
    assert loaded.temperatures.tolist() == pytest.approx([0.0, 0.7, -1.0, -1.0])
    store.check_meta({"seed": 0})
    store.check_meta({"seed": 0})
    with pytest.raises(ValueError, match="seed"):
        store.check_meta({"seed": 1})


def test_corpus_is_cut_into_windows(tmp_path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(f"paragraph {i} has a few words in it" for i in range(40)))
    seqs = corpus_sequences(path, WordTokenizer(), seq_len=16, heldout_permille=100)
    assert len(seqs) >= 15 and set(seqs.lengths[:-1].tolist()) == {16}
    assert (seqs.prompt_lens == 0).all() and (seqs.temperatures == NOT_TARGET_OUTPUT).all()


def test_batch_sampler_is_deterministic_resumable_and_length_bucketed() -> None:
    rng = np.random.default_rng(0)
    seqs = SequenceSet.from_lists(
        [rng.integers(0, 50, int(n)) for n in rng.integers(4, 90, 200)], [2] * 200, [0.0] * 200, [False] * 200
    )
    a = BatchSampler(seqs, batch_size=8, max_seq_len=64, seed=3)
    first = [a.next_indices() for _ in range(30)]  # crosses an epoch (200 // 8 = 25 batches)
    b = BatchSampler(seqs, batch_size=8, max_seq_len=64, seed=3)
    for _ in range(11):
        b.next_indices()
    c = BatchSampler(seqs, batch_size=8, max_seq_len=64, seed=3)
    c.load_state_dict(b.state_dict())
    assert all(np.array_equal(x, y) for x, y in zip(first[11:], [c.next_indices() for _ in range(19)], strict=True))
    spread = [np.ptp(seqs.lengths[i]) for i in first[:20]]
    assert np.median(spread) < 20  # rows of a batch have similar lengths
    batch = pad_batch(seqs, first[0], torch.device("cpu"), max_seq_len=64)
    assert batch.tokens.shape[1] % 32 == 0 and int(batch.lengths.max()) <= 64


@torch.no_grad()
def test_dense_generator_greedy_is_the_targets_argmax_chain() -> None:
    config = tiny_target_config()
    target = tiny_target(config, seed=3)
    generator = DenseGenerator(target, config, [EOS], torch.device("cpu"), max_rows=3)
    prompts = [[1, 5, 9, 10, 11], [1, 7], [1, 20, 21, 22, 23, 24, 25, 26], [1, 3, 4, 30]]
    answers = generator.generate(prompts, [0.0] * 4, [1, 2, 3, 4], max_new_tokens=20)
    for prompt, answer in zip(prompts, answers, strict=True):
        assert 1 <= len(answer) <= 20
        assert EOS not in answer[:-1]
        seq = torch.tensor(prompt + answer)[None]
        argmax = run_teacher(target, (0, 1), seq, torch.tensor([seq.shape[1]])).argmax_all()[0]
        assert torch.equal(argmax[len(prompt) - 1 : -1], seq[0, len(prompt) :])
    sampled = generator.generate(prompts, [1.0] * 4, [1, 2, 3, 4], max_new_tokens=20)
    assert sampled == generator.generate(prompts, [1.0] * 4, [1, 2, 3, 4], max_new_tokens=20)
    assert sampled != answers


def test_prompt_set_grows_past_one_round_keeping_its_prefix_and_mix() -> None:
    one_round = build_prompt_set(7000, seed=0)
    larger = build_prompt_set(15_000, seed=0)
    assert len(larger) == 15_000 and len({p.key for p in larger}) == 15_000
    assert [p.key for p in larger[:7000]] == [p.key for p in one_round]
    first = collections.Counter(p.domain for p in larger[:7000])
    later = collections.Counter(p.domain for p in larger[7000:])
    assert set(later) >= {"coding", "explain", "creative", "tool-call"}
    for domain, count in later.items():  # no domain adds more per round than round 0 gave it
        assert count <= 2 * first[domain], domain


def test_sampled_temperatures_get_several_answers_with_distinct_seeds() -> None:
    plan = GenerationPlan(temperatures=(0.0, 0.7), samples_per_temperature=3, chunk_size=100)
    jobs = [j for chunk in plan_jobs(build_prompt_set(4, seed=0), WordTokenizer(), plan) for j in chunk]
    assert len(jobs) == 4 * (1 + 3)
    greedy = [j for j in jobs if j.temperature == 0.0]
    assert len(greedy) == 4 and {j.sample for j in greedy} == {0}
    seeds = {job_seed(plan.seed, j.prompt_index, j.temperature, j.sample) for j in jobs}
    assert len(seeds) == len(jobs)
    # the first answer keeps the seed it had before samples_per_temperature existed
    assert job_seed(0, 5, 0.7, 0) == job_seed(0, 5, 0.7)
    with pytest.raises(ValueError, match="samples_per_temperature"):
        GenerationPlan(samples_per_temperature=0)


def test_generate_dataset_writes_shards_resumes_and_stops_at_deadline(tmp_path) -> None:
    config = tiny_target_config()
    target = tiny_target(config, seed=4)
    generator = DenseGenerator(target, config, [EOS], torch.device("cpu"), max_rows=16)
    plan = GenerationPlan(temperatures=(0.0, 0.7), max_new_tokens=8, chunk_size=10, heldout_permille=200)
    chunks = plan_jobs(build_prompt_set(12, seed=0), WordTokenizer(), plan)
    assert sum(len(c) for c in chunks) == 24 and len(chunks) == 3
    store = ShardStore(tmp_path / "data")
    stopped = generate_dataset(store, chunks, generator, plan, deadline=0.0, progress=False)
    assert stopped.stopped_by_deadline and stopped.shards_written == 0 and missing_chunks(store, chunks) == 3
    report = generate_dataset(store, chunks, generator, plan, progress=False)
    assert report.shards_written == 3 and missing_chunks(store, chunks) == 0
    again = generate_dataset(store, chunks, generator, plan, progress=False)
    assert again.shards_written == 0 and again.shards_reused == 3
    seqs = store.load_all()
    assert len(seqs) == 24
    assert sorted(set(seqs.temperatures.tolist())) == pytest.approx([0.0, 0.7])
    assert (seqs.lengths > seqs.prompt_lens).all()
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_dataset(
            store,
            chunks,
            generator,
            GenerationPlan(temperatures=(0.0, 0.7), max_new_tokens=9, chunk_size=10, heldout_permille=200),
        )


@torch.no_grad()
def test_engine_and_dense_generators_agree_on_greedy_answers(tmp_path) -> None:
    """engine.LLM (the serving path) and the dense sampler give the same greedy answers."""
    pytest.importorskip("engine.llm", reason="the offline engine is not importable here")
    from train_helpers import save_hf_target

    from training.generate import EngineGenerator

    config = tiny_target_config()
    target = tiny_target(config, seed=7)
    save_hf_target(tmp_path / "hf", target, config)
    engine = EngineGenerator(str(tmp_path / "hf"), device="cpu", max_num_seqs=4, kv_cache_memory_bytes=1 << 20)
    dense = DenseGenerator(target, config, [EOS], torch.device("cpu"))
    prompts = [[3, 25, 23, 9, 22, 53, 12], [3, 5, 6, 7], [3, 9, 9, 9, 9, 9, 9, 9, 9, 10], [3, 11]]
    temps, seeds = [0.0] * 4, [1, 2, 3, 4]
    assert engine.generate(prompts, temps, seeds, 20) == dense.generate(prompts, temps, seeds, 20)
    sampled = engine.generate(prompts, [1.0] * 4, seeds, 20)
    assert sampled == engine.generate(prompts, [1.0] * 4, seeds, 20)  # seeded per request
    assert all(EOS not in answer[:-1] for answer in sampled)
