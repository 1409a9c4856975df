"""Programs around the library, not part of it: the launcher (``launch``: ``polycast
run``), the machine check (``doctor``), the self-test and benchmark ranks (``selftest``,
``bench_rank``), the calibration that measures this machine for the planner
(``calibrate``) and the planner's check against the simulator (``plancheck``). They use
the library through its API; nothing in the library imports them."""
