#!/usr/bin/env python3
"""Reads the per-CTA timeline of the deep GEMM that the DFLASH_TIMELINE_HACK build writes
(docs/probes/README.md) and prints one line per launch: CTAs, first start / first end / last start /
last end (us from the first CTA's start, %globaltimer) and the per-CTA medians (clock64, us) from
the start to: the PDL wait's return, the first weight stage landed, the main loop's end; the
reduction and epilogue ("tail"); and the whole life. Launches are told apart by their n and by
gaps of more than 4 us between CTA starts (a heuristic: the first launch of a layer can split
where some of its CTAs start early on free SMs). Usage: gemm_timeline.py TIMELINE.txt ...
Needs numpy."""
import numpy as np, sys
for fn in sys.argv[1:]:
    a=np.loadtxt(fn,dtype=np.int64)
    sm,n,n0,g0,g3,c0,c1,cf,c2,c3=a.T
    clk=np.median((c3-c0)/(g3-g0))
    T0=g0.min()
    launches=[]
    for nv in np.unique(n):
        idx=np.where(n==nv)[0]; idx=idx[np.argsort(g0[idx])]
        cur=[idx[0]]
        for i in idx[1:]:
            if g0[i]-g0[cur[-1]]>4000: launches.append(cur); cur=[i]
            else: cur.append(i)
        launches.append(cur)
    launches.sort(key=lambda l: g0[l].min())
    print(fn, 'clock GHz %.3f'%clk, 'records', len(a), 'span us %.1f'%((g3.max()-T0)/1e3))
    print('%-7s %4s %7s %7s %7s %7s | median per-CTA us: %6s %6s %6s %6s %6s'%('n','ctas','start','1st_end','last_st','end','wait','first','loop','tail','life'))
    for l in launches:
        l=np.array(l)
        s=(g0[l]-T0)/1e3; e=(g3[l]-T0)/1e3
        w=(c1[l]-c0[l])/clk/1e3; f=(cf[l]-c0[l])/clk/1e3; lp=(c2[l]-c0[l])/clk/1e3; tl=(c3[l]-c2[l])/clk/1e3; life=(c3[l]-c0[l])/clk/1e3
        print('%-7d %4d %7.1f %7.1f %7.1f %7.1f | %6.2f %6.2f %6.2f %6.2f %6.2f'%(n[l[0]],len(l),s.min(),e.min(),s.max(),e.max(),np.median(w),np.median(f),np.median(lp),np.median(tl),np.median(life)))
