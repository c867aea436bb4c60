"""The script that timed the forward + backward table of stream_images_32.md, as it ran on the
H100 (from the repository root, PYTHONPATH=.): psa_attention(area=A) through autograd on the qkv
conv output's views, bf16, head dims (32, 32), stream images forbidden / forced / forbidden /
forced; CUDA events around 20 calls after 3 warm-up calls (host gaps included), us per call.
Kept beside its output because it is not one of bench/'s tools."""
import torch, psa_fa2_ext
from psa_fa2_ext import _testing
def t(B,H,N,A,way):
    x=torch.randn(B,H*96,N,device="cuda",dtype=torch.bfloat16,requires_grad=True)
    q,k,v=x.view(B,H,96,N).split([32,32,32],2)
    g=torch.randn(B,H,32,N,device="cuda",dtype=torch.bfloat16)
    with _testing.force(stream_images=way):
        for _ in range(3): psa_fa2_ext.psa_attention(q,k,v,area=A).backward(g)
        torch.cuda.synchronize(); s=torch.cuda.Event(True); e=torch.cuda.Event(True); s.record()
        for _ in range(20): psa_fa2_ext.psa_attention(q,k,v,area=A).backward(g)
        e.record(); torch.cuda.synchronize(); return s.elapsed_time(e)/20*1000
for shp in [(1,2,25600,4),(1,12,25600,4),(16,2,25600,4),(1,2,6400,1),(16,12,6400,4)]:
    r=[(w,t(*shp,w)) for w in ("never","always","never","always")]
    print(shp, " ".join(f"{w}:{u:.1f}" for w,u in r), flush=True)
