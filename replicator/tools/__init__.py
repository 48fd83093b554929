"""Tools operators run by hand: `verify` (does the destination hold what the source holds?) and Mirus's offset file
formats.
"""
