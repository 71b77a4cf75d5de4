import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import hookpatch  # noqa
except Exception as e:
    print("hookpatch failed", e)
