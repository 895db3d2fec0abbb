"""What a launcher and its workers agree on, apart from either: the environment each worker gets
(``env``), the keys of an elastic launch's rendezvous in the launcher's store
(``elastic_rendezvous``) and a rank's place (``slots``).

The launcher (``runner/``) writes this contract and the frontends (``torch/``, ``keras/``,
``doctor/``) read it; both import it, so the frontends never import the launcher. Standard
library only (and the engine's own config type, which is too).
"""
