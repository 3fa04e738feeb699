"""A run's logs: every rank's stdout and stderr, split into attempts (``python -m hpctrain logs``; docs/logs.md).

Stdlib only: a login-node tool.
"""

from hpctrain.logs.reader import LogAttempt, LogFile, RankLog, Traceback, first_traceback, log_attempts, rank_errors

__all__ = ["LogAttempt", "LogFile", "RankLog", "Traceback", "first_traceback", "log_attempts", "rank_errors"]
