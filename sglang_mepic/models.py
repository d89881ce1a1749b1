"""`python -m sglang_mepic.models`, the command users type: the code is in `sglang_mepic/launch/models.py`."""

from sglang_mepic.launch.models import main

if __name__ == "__main__":
    main()
