"""Serving: check a snapshot out beside a symlink a serving process reads, flip it atomically, roll it back.

``versions`` lays out the versions folder beside the link (``<parent>/.<name>.versions/``), holds
its lock, flips the link and keeps the node's history; ``checkout`` materialises a root there,
reusing the bytes of the versions already on the node; ``health`` runs the gate after a flip.
"""
