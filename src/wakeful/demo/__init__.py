"""The crash-and-recover demo (``make demo``, ``wakeful demo``)."""
