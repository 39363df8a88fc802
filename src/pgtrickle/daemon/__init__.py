"""The daemon: the scheduler loop (`pgtrickle run`) and manual refreshes, on top of the refresh engine."""
