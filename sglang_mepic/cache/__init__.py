"""Scheduler side: the mepic radix cache, a request's link and plan, admission, SGLang's round steps
(prefill_round, batch_join, extend) and its figures."""
