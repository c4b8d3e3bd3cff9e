"""The TPUJob's policies: each decides one concern of a reconcile, from what the job shows
(``plan.JobFacts``) and the cluster around it (``plan.World``), into one ``plan.Plan``.

The job reconciler (``reconcile/jobs.py``) reads like a table of contents: it gathers the
facts, runs these policies in order, commits the plan's status once and acts on it.
Nothing here does I/O: the world is read through the ``World`` protocol, whose one write
(reserving the pools an allocation chose) is in memory. Each module has a table-driven
unit test beside it (``tests/unit/policies/``).

- ``start``: placement and the start of an attempt (first run, resume).
- ``pools``: recorded pools with no nodes left, and pools GKE created for claims.
- ``verdict``: whether the running attempt failed, succeeded or goes on: one decider over
  every source (the gang, stalls, in-place restarts, a failure's echo, a drain).
- ``failure``: the failure policy, the kind of restart, and failing the job.
- ``success``: a job whose workers are done.
- ``suspend``: suspension, and the end of a finished or suspended job's pods.
- ``lifetime``: ``activeDeadlineSeconds`` and ``ttlSecondsAfterFinished``.
- ``patience``: ``waitingTimeoutSeconds``, how long a job may wait for capacity.
- ``phase``: the phase, message and conditions of an attempt that goes on.
- ``waiting``: why pods wait (unschedulable, refused, no scheduler, others on the pools).
- ``stalls``: stalled training and stragglers.
- ``in_place``: in-place restarts that cannot finish.
- ``notices``: GKE's maintenance notices on the nodes of a running job.
- ``standalone``: a standalone TPUSlice, its own job of one slice: its attempt (a resume
  starts a new one) and its failed attempts, through ``failure.book``.
- ``slice_phase``: a TPUSlice's phase and message (a job's slice or a standalone one), one
  ladder over its gang and what holds it back, for the slice reconciler
  (``reconcile/slices.py``); an attempt that goes on takes the job's phase
  (``phase.of_attempt``).
"""
