"""Reading what a job left, safely: the one no-follow, non-blocking open (``safe_open``), walks
of a job's folder in path order (``folder_walk``), record files another process wrote
(``record_file``), a folder as one tar stream (``archive``) and its extraction on the client
(``extract``), and what of a working dir is copied (``workdir``). Below both the client and the
service; imports only :mod:`ringtrain.jobs.errors`."""
