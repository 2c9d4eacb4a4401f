"""What every measurement shares: the problem and its inputs, the implementations compared, the fp64
reference, the error metrics, measured memory and time, provenance and the results files.

Nothing here draws, judges or reads a study; every other folder of :mod:`analysis` builds on this one.
"""
