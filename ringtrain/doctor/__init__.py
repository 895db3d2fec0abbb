"""``ringtrain doctor``: is the input pipeline keeping the model fed, and what would fix it.

``trials`` trains a few steps of one configuration (synthetic data, torchvision's loader,
ringtrain's pipeline on files, packed or GPU-decoded) with the step profiler on; ``advice`` turns
the measurements into advice with numbers (pure); ``report`` prints it, as text or JSON, and
draws the chart; ``cli`` is the command, which runs under ``ringtrain run`` or launches itself.
"""
