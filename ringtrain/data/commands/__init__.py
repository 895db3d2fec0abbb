"""The subcommands of `ringtrain data`, one module each (see :mod:`ringtrain.data.cli`)."""
