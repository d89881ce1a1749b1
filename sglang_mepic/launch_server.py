"""`python -m sglang_mepic.launch_server`, the command users type: the code is in `sglang_mepic/launch/server.py`."""

from sglang_mepic.launch.server import main

if __name__ == "__main__":
    main()
