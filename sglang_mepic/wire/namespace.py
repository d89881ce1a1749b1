"""A request's namespace: what keeps its cache entries apart from another tenant's. One rule, both processes.

SGLang makes an empty `extra_key` none when it reads a request (`GenerateReqInput._normalize_extra_key`, single
and batch alike) and an empty `cache_salt` none when it builds the scheduler's `Req`; its radix tree then keys
pages by what is left. The tokenizer side finds and registers texts in a namespace (frontend/known_texts.py:
`POST /mepic/chunks` reads its body before SGLang normalizes anything), the scheduler side keys chunks by it
(cache/link.py): both apply this rule, so a text registered with `extra_key: ""` is found for the requests
SGLang keys as that tenant's, and for no other.
"""


def tenant_key(extra_key: str | None, cache_salt: str | None) -> tuple[str | None, str | None]:
    """(extra_key, cache_salt) as SGLang tells tenants apart: empty is none. Intake refuses any that is not a
    string (hardening/scheduler_fields.py, frontend/known_routes.py)."""
    return extra_key or None, cache_salt or None
