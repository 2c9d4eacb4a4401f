"""Planning: what one call will run, decided before it runs.

``options`` (what the user asked), ``policies`` (the precision layouts and the "auto" table, as data), ``device``
and ``cpu_gemms`` (what the device can do: probed once, read by the planner), ``plan`` (the resolved
:class:`~lce.planning.plan.Plan`: chunking, dtypes, layout, backend) and ``memory_model`` (every buffer the plan
allocates, and its predicted peak). Nothing here runs the op.
"""
