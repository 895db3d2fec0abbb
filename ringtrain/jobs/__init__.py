"""The ringtrain job service. Its folders are its layers:

- this package's modules and ``models/``: what both sides share (specs, states, infos, the REST
  bodies, errors, the home, a job folder's map);
- ``files/``: the one safe way to read what a job left;
- ``client/``: the REST client and finding a home's server;
- ``service/``: the store, scheduler, executors, monitor, API and server;
- ``cli/``: the command line over the client (and the server it starts).

The service never imports torch: jobs reach training only through ``ringtrain run`` in a
subprocess.
"""
