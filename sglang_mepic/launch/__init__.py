"""Launcher side: the server and cluster launchers, Mooncake's master, model folders, server processes."""
