"""Jobs: the contract with a job's process (its context, block records, supervisor, sandbox
and privacy primitives); the built-in job kinds live above it in :mod:`privsched.trainers`."""
