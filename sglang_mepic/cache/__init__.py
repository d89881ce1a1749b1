"""Scheduler side: the mepic radix cache, a request's link and plan, admission, scheduling and its figures."""
