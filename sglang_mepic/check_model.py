"""`python -m sglang_mepic.check_model`, the command users type: the code is in `sglang_mepic/gate/check_model.py`."""

import sys

from sglang_mepic.gate.check_model import main

if __name__ == "__main__":
    sys.exit(main())
