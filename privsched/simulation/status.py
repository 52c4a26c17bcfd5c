"""A pipeline's outcome in a simulation run, as the small integer codes the simulator stores."""

NOT_ARRIVED, PENDING, GRANTED, TIMED_OUT = 0, 1, 2, 3
#: Each code's name, as results report it.
STATUS_NAMES = ("not_arrived", "pending", "granted", "timed_out")
