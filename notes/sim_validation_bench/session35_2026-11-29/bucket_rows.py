"""W = 4 TWRW's DDP bucket per kept run, two rescorings side by side: python bucket_rows.py BASE_TAG TAG"""
import json, sys
bt, vt = sys.argv[1], sys.argv[2]
print(f"run   {bt}: pipelined  plain   | {vt}: pipelined  plain")
for r in "FA FB FC FD FE FF FG FH FI FJ FK FL FM".split():
    out = []
    for t in (bt, vt):
        j = json.load(open(f"/tmp/s35/{t}_{r}.json"))
        for x in j["rows"]:
            if x["W"] == 4 and x["plan"] == "twrw":
                c = [c for c in x["collectives"] if c["marker"] == "dense_allreduce"][0]
                out.append(f"{c['error']:+7.1%}")
    print(f"{r}    {out[0]}  {out[1]}      |  {out[2]}  {out[3]}")
