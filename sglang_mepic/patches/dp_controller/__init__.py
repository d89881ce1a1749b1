"""Hooks in SGLang's data-parallel controller process (`--dp-size` above 1), which routes each request to a
replica: chunk affinity with the mepic cache (sglang_mepic/scale_out/)."""

MODULES = (
    "data_parallel_controller_round_robin_scheduler",
)
