"""How the ranks of a job find each other: the job's environment (``env``: polycast run,
torchrun, mpiexec, srun), the rendezvous store (``store``) and its authentication
(``auth``), the connected world (``world``: one link per pair of ranks), the engine
configuration a rank derives from it (``engine_config``) and what a rank reports to its
launcher when it fails (``report``)."""
