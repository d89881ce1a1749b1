"""The chunk markers of the wire protocol: in text, and as the two negative ids in `input_ids`.

They are constants both sides and the client agree on, so they live below everything that uses
them (markup.py parses them; the launcher refuses a separator that holds them).
"""

CHUNK_OPEN = "<|chunk|>"
CHUNK_CLOSE = "<|/chunk|>"
CHUNK_BEGIN_ID = -100  # negative: never a real token id
CHUNK_END_ID = -101
