"""More than one replica in one server: how the DP controller routes a request by its chunks."""
