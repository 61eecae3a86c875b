"""fp16 chunks (the transfer limit) -> fp32 safetensors folder /root/mpnet."""

import sys
import shutil
import glob
import os
from safetensors.torch import load_file, save_file

src, dst, cfg = sys.argv[1:4]
os.makedirs(dst, exist_ok=True)
with open("/tmp/m16.safetensors", "wb") as out:
    for part in sorted(glob.glob(src + "*")):
        out.write(open(part, "rb").read())
sd = load_file("/tmp/m16.safetensors")
save_file(
    {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in sd.items()}, dst + "/model.safetensors"
)
for f in glob.glob(cfg + "/*"):
    shutil.copy(f, dst)
print(dst, "tensors", len(sd))
