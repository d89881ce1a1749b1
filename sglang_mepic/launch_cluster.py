"""`python -m sglang_mepic.launch_cluster`, the command users type: the code is in `sglang_mepic/launch/cluster.py`."""

from sglang_mepic.launch.cluster import main

if __name__ == "__main__":
    main()
