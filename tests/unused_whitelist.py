"""Names the unused-code check (tests/test_structure.py) would flag, each reviewed: read by
something it cannot see. Add a name only with its reason."""

# ruff: noqa: F821

# record fields: written to the records (dataclasses.asdict), read by the analysis from the table
_.not_clearly_better  # analysis/lookup_verdicts.LookupVerdict, in the decomposition's records
_.tokens_per_s  # models/training epoch record, in the drafters stage's history
_.finish_reason  # probes/api_floors and probes/serving request records
_.self_token  # probes/drafter_eval path records
_.t1_uncovered_paths  # probes/record_types.SlotFloorRecord, read by analysis/floors by column name
_.t1_reweighted_ess_mean  # probes/record_types.SlotFloorRecord, as above
_.latency_s  # probes/serving.ServedRequest, read by analysis/serving by column name
_.ttft_s  # probes/serving.ServedRequest, as above
# set on objects of other libraries, which read them
_._expand_kernel_impl  # engine_plugins: the vLLM sampler kernel it replaces
_.pad_token  # models/targets: the tokenizer's padding token
_.MAX_NUM_TOKENS  # engine_plugins: a keyword the kernel's launch passes by name
