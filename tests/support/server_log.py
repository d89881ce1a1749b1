"""What a test reads from a server's log."""

import re


def prefill_logged(log: str, new: int, cached: int) -> bool:
    """Whether SGLang's prefill log shows a request computing `new` tokens over `cached` ones:
    on a batch line of its own, or batched with others that add cached tokens."""
    if f"#new-seq: 1, #new-token: {new}, #cached-token: {cached}," in log:
        return True
    return any(int(seqs) > 1 and int(hit) > cached
               for seqs, hit in re.findall(rf"#new-seq: (\d+), #new-token: {new}, #cached-token: (\d+),", log))
