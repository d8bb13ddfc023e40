"""CUDA kernel sources (*.cu), read as package data. Installed as `rawpage.cuda`; see README.md."""
