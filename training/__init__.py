"""Training a DSpark drafter by distillation from its target (docs/design.md §3 "Training").

prompts.py, prompt_topics.py   the chat prompt set (templates x topics from data/, held-out split by hash)
generate.py                    the target answers it (engine.LLM or a dense sampler) into shards
data.py, batches.py            sequence shards on disk; padded, length-bucketed batches
dense_attention.py             attention backends for dense offline forwards
teacher.py                     the target's pass: captured hidden + its next-token laws
block.py                       the drafter's block forward for many anchors, as inference runs it
objective.py                   losses (Markov-corrected CE, confidence BCE)
init.py                        starting weights copied from the target
trainer.py                     the loop: AdamW, schedule, checkpoints, time budget, resume
evaluate.py                    held-out acceptance, greedy walk and sampled estimate
pipeline.py                    the whole run
command.py                     its options and entry point (`dspark-serve train-drafter`, services/cli)
"""
