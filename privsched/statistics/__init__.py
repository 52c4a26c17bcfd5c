"""DP statistics: their description, the mechanism they are charged, and their release with
floating-point-safe noise. The built-in statistic job (:mod:`privsched.trainers.statistics`)
and the privacy primitives of user jobs (:mod:`privsched.jobs.primitives`) both use it."""
