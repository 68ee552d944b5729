import os, sys
if os.environ.get("SWI"):
    sys.setswitchinterval(float(os.environ["SWI"]))
