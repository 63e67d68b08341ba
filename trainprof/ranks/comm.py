"""Moved to trainprof/analysis/comm.py (a per-trace analysis the comm-bound rule shares with the
multi-rank view); kept so that `from trainprof.ranks.comm import comm_stats` still works."""

from trainprof.analysis.comm import HOST_COMM_OPS, CommStats, comm_stats

__all__ = ["HOST_COMM_OPS", "CommStats", "comm_stats"]
