"""The dashboard page: one self-contained HTML document (inline CSS, JS and SVG; no CDN).

It polls ``api/summary`` every two seconds and redraws in place: a line with
the swarm's learning verdict, the command that joins it and its uptime;
summary cards, reward curves (local solid, external dashed; moving average
over 10 rounds), a per-node table (a sparkline and verdict per node; compact
columns that fit a 1280 px window, the table marked ``data-fits`` when they
do) and groups not used, by reason, with what "no signal" means. Held-out
accuracy (the one figure comparable across nodes and runs) shows as a card,
as a node table column "start -> now" with a per-family tooltip, and as a
panel with its curve and a per-family table; the panel stays hidden until
some node has evaluated, and the card names the flag that turns it on.
Elements carry ``id`` or ``data-k`` attributes so tests can read the figures
from the DOM.
"""

from __future__ import annotations

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>swarm-node dashboard</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;background:#f5f6f8;color:#1d232b}
header{background:#1d2733;color:#fff;padding:12px 20px;display:flex;justify-content:space-between;align-items:baseline}
header h1{font-size:18px;margin:0}#updated,#version{font-size:12px;color:#b9c4d0}#version{margin-left:8px}
main{padding:16px 20px}.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(116px,1fr));gap:10px}
.card{background:#fff;border-radius:6px;padding:10px 12px;box-shadow:0 1px 2px #0002}
.card .k{font-size:11px;color:#667;text-transform:uppercase;letter-spacing:.04em}.card .v{font-size:20px;margin-top:4px}
.card .s{font-size:11px;margin-top:2px}td[title]{cursor:help;text-decoration:underline dotted #99a}
section{background:#fff;border-radius:6px;margin-top:14px;padding:12px;box-shadow:0 1px 2px #0002}
h2{font-size:14px;margin:0 0 8px}table{border-collapse:collapse;width:100%;font-size:12px}
th,td{text-align:right;padding:3px;border-bottom:1px solid #eceef1;white-space:nowrap}
th{font-weight:600;white-space:normal;vertical-align:bottom}th[title]{cursor:help;text-decoration:underline dotted #99a}
td.wrap{white-space:normal;min-width:96px;max-width:112px;text-align:left}.sub{font-size:11px;color:#889}
#swarm{display:flex;flex-wrap:wrap;gap:6px 18px;align-items:baseline;margin-bottom:12px;font-size:13px}
#swarm code{background:#fff;border:1px solid #d8dde3;border-radius:4px;padding:2px 6px;font-size:12px;
user-select:all;word-break:break-all}.tr-learning{color:#18794e}.tr-getting{color:#b03030}.tr-flat,.tr-too{color:#778}
svg.spark{vertical-align:middle;margin-right:4px}.scroll.more{box-shadow:inset -10px 0 8px -8px #0004}
th:first-child,td:first-child,#peers td:nth-child(2),#peers th:nth-child(2){text-align:left}
.st-running{color:#18794e}.st-silent,.st-left{color:#a15c00}.st-done{color:#3457a6}
#legend span{display:inline-block;margin-right:14px;font-size:12px}#legend i{display:inline-block;width:18px;height:3px;
vertical-align:middle;margin-right:4px}svg text{font-size:11px;fill:#667}.muted{color:#889}.scroll{overflow-x:auto}
</style></head><body>
<header><h1 id="title">swarm-node</h1><span><span id="updated">connecting...</span><span id="version"></span></span>
</header>
<main>
<div id="swarm"><span><b>Is it learning?</b> <span id="verdict">-</span></span>
<span><b>Join:</b> <code id="join">-</code></span><span><b>Up:</b> <span id="uptime">-</span></span></div>
<div class="cards">
<div class="card"><div class="k">nodes running</div><div class="v" id="t-nodes">-</div></div>
<div class="card"><div class="k">rounds (all nodes)</div><div class="v" id="t-rounds">-</div></div>
<div class="card"><div class="k">peers seen</div><div class="v" id="t-peers">-</div></div>
<div class="card"><div class="k">groups accepted / used</div><div class="v" id="t-groups">-</div></div>
<div class="card"><div class="k">rejected</div><div class="v" id="t-rejected">-</div></div>
<div class="card"><div class="k">sync committed / aborted</div><div class="v" id="t-sync">-</div></div>
<div class="card"><div class="k">sync revision</div><div class="v" id="t-revision">-</div></div>
<div class="card"><div class="k">bytes in / out</div><div class="v" id="t-bytes">-</div></div>
<div class="card"><div class="k">held-out accuracy</div><div class="v" id="t-heldout">-</div>
<div class="s muted" id="t-heldout-first">no evaluation yet</div></div>
</div>
<section><h2>Reward per round <span class="muted">(moving average of 10; solid: local, dashed: external)</span></h2>
<svg id="chart" viewBox="0 0 1000 280" width="100%" height="280" preserveAspectRatio="none"></svg>
<div id="legend"></div></section>
<section><h2>Nodes</h2><div class="scroll" id="nodes-wrap"><table id="nodes"><thead><tr>
<th title="the node's short peer id (its join command in the tip) and model">peer / model</th><th>status</th>
<th title="time since the node's process started">up</th><th>round</th>
<th title="held-out accuracy once evaluated twice, else the training reward;
a change smaller than the noise of the figures reads as flat">trend</th>
<th title="mean reward of the node's own completions, last round">reward</th>
<th title="mean reward of the peers' completions it trained on, last round">ext. reward</th><th>peers</th>
<th title="peers' groups that passed the checks / trained on / refused (by reason below)">
groups ok / used / rejected</th>
<th>fetch failed</th>
<th title="groups whose completions all scored the same reward: GRPO's advantage
(reward minus the group's mean) is zero for each, so the group teaches nothing">no signal</th>
<th title="outer-sync rounds committed / aborted, and the revision of the weights">sync ok / aborted</th>
<th>bytes in / out</th>
<th>last sync</th><th title="seconds of the last round; under it, tokens per second of its sampling (completion
tokens) / training (tokens through the step)">round s</th>
<th title="resident memory: node process / its DHT and p2pd">memory MB</th>
<th title="CPU seconds since start: node / DHT and p2pd">CPU s</th>
<th title="greedy accuracy on held-out questions no node trains on: first -> latest, and the round and age of
the latest evaluation (its sampled reward and per-family scores in the cell's tip)">held-out</th>
</tr></thead><tbody></tbody></table></div></section>
<section id="heldout" hidden><h2>Held-out accuracy per evaluation <span class="muted">(greedy; colors as above)</span>
</h2><svg id="heldout-chart" viewBox="0 0 1000 200" width="100%" height="200" preserveAspectRatio="none"></svg>
<h2>By task family <span class="muted">(last evaluation)</span></h2><div class="scroll">
<table id="heldout-families"><thead></thead><tbody></tbody></table></div></section>
<section><h2>Peers <span class="muted">(publishers each node took from or refused; most recent first)</span></h2>
<div class="scroll"><table id="peers"><thead><tr><th>node</th><th>peer</th><th>last seen</th><th>round</th>
<th>batches</th><th>groups used</th><th>refused</th></tr></thead><tbody></tbody></table></div></section>
<section><h2>Groups not used, by reason</h2><table id="reasons">
<thead><tr><th>reason</th><th>kind</th><th>count</th></tr></thead><tbody></tbody></table>
<p class="muted" id="no-signal-help">no signal: every completion of the group scored the same reward, so GRPO's
advantage (a completion's reward minus its group's mean) is zero and the group has nothing to teach; a task that
is always or never solved gives only such groups.</p></section>
</main>
<script>
"use strict";
const COLORS=["#2f6fde","#e0702a","#2a9d5c","#c23b7a","#7b52c7","#8c6d1f","#1f9aa8","#b03030"];
const $=id=>document.getElementById(id);
const fmt=(v,d)=>v===null||v===undefined?"-":(typeof v==="number"?v.toFixed(d):String(v));
function human(n){const u=["B","KB","MB","GB","TB"];let i=0;while(n>=1024&&i<u.length-1){n/=1024;i++;}
  return (i?n.toFixed(n<10?1:0):String(n))+" "+u[i];}
function smooth(pts,w){const out=[];let s=0,q=[];for(const [x,y] of pts){q.push(y);s+=y;if(q.length>w)s-=q.shift();
  out.push([x,s/q.length]);}return out;}
function cell(k,v){const td=document.createElement("td");td.dataset.k=k;td.textContent=v;return td;}
function sub(td,text){const d=document.createElement("div");d.className="sub";d.textContent=text;td.appendChild(d);}
function ago(s){if(s===null||s===undefined)return "-";s=Math.max(0,Math.round(s));
  return (s<120?s+"s":s<7200?Math.round(s/60)+"m":Math.round(s/3600)+"h")+" ago";}
function plot(svg,H,lines,maxX,lo,hi,dots){
  const W=1000,L=40,B=22,X=x=>L+(W-L-8)*x/maxX,Y=y=>8+(H-B-8)*(1-(y-lo)/((hi-lo)||1));
  let s="";for(let k=0;k<=4;k++){const y=lo+(hi-lo)*k/4;
    s+=`<line x1="${L}" x2="${W}" y1="${Y(y)}" y2="${Y(y)}" stroke="#e3e6ea"/>`;
    s+=`<text x="4" y="${Y(y)+4}">${y.toFixed(2)}</text>`;}
  s+=`<text x="${W-60}" y="${H-6}">round ${maxX}</text><text x="${L}" y="${H-6}">0</text>`;
  for(const [pts,c,dash] of lines){if(!pts.length)continue;
    const d=pts.map((p,j)=>(j?"L":"M")+X(p[0]).toFixed(1)+" "+Y(p[1]).toFixed(1)).join(" ");
    s+=`<path d="${d}" fill="none" stroke="${c}" stroke-width="2" stroke-dasharray="${dash}"/>`;
    if(dots)for(const p of pts)s+=`<circle cx="${X(p[0]).toFixed(1)}" cy="${Y(p[1]).toFixed(1)}" r="3" fill="${c}"/>`;}
  svg.innerHTML=s;
}
function drawChart(nodes){
  let maxX=1,lo=0,hi=0;const lines=[];
  nodes.forEach((n,i)=>{const c=COLORS[i%COLORS.length];
    const loc=smooth(n.series.map(p=>[p[0],p[1]]),10);
    const ext=smooth(n.series.filter(p=>p[2]!==null).map(p=>[p[0],p[2]]),10);
    for(const [x,y] of loc.concat(ext)){maxX=Math.max(maxX,x);lo=Math.min(lo,y);hi=Math.max(hi,y);}
    lines.push([loc,c,""],[ext,c,"6 4"]);});
  hi=[0.05,0.1,0.2,0.4,0.6,0.8,1].find(v=>v>=hi)||Math.ceil(hi);
  plot($("chart"),280,lines,maxX,lo,hi,false);
  $("legend").innerHTML=nodes.map((n,i)=>`<span><i style="background:${COLORS[i%COLORS.length]}"></i>`+
    `${n.peer} (${n.model})</span>`).join("");
}
function heldoutTip(h){
  const fam=Object.entries(h.per_family).map(([f,v])=>"  "+f+": "+fmt(v,3));
  return ["round "+h.first_round+": "+fmt(h.first_accuracy,3)+", round "+h.round+": "+fmt(h.accuracy,3),
    "sampled reward: "+fmt(h.sample_reward,3),
    (h.items===null?"?":h.items)+" questions"+(h.complete===false?" (partial: cut by the time bound)":""),
    ...(fam.length?["per family:",...fam]:[])].join("\n");
}
const EVAL_HINT="no evaluation yet: --eval-every N evaluates every N rounds (and before the first, after the last)";
function heldoutCells(h){
  if(!h){const c=cell("heldout","-");c.title=EVAL_HINT;
    return [c];}
  const now=fmt(h.accuracy,3)+(h.complete===false?"*":"");
  const acc=cell("heldout",h.round===h.first_round?now:fmt(h.first_accuracy,3)+" \u2192 "+now);
  acc.title=heldoutTip(h);
  sub(acc,"r"+h.round+", "+ago(h.age_s));return [acc];
}
function duration(s){if(s===null||s===undefined)return "-";s=Math.round(s);
  return s<120?s+"s":s<7200?Math.round(s/60)+"m":(s/3600).toFixed(1)+"h";}
function spark(pts,c){
  if(pts.length<2)return "";const W=64,H=18,x0=pts[0][0],x1=pts[pts.length-1][0],ys=pts.map(p=>p[1]);
  const lo=Math.min(...ys),hi=Math.max(...ys),X=x=>2+(W-4)*(x-x0)/((x1-x0)||1),Y=y=>H-2-(H-4)*(y-lo)/((hi-lo)||1);
  const d=pts.map((p,j)=>(j?"L":"M")+X(p[0]).toFixed(1)+" "+Y(p[1]).toFixed(1)).join(" ");
  return `<svg class="spark" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}"><path d="${d}" fill="none" `+
    `stroke="${c}" stroke-width="1.5"/></svg>`;
}
function trendCell(n,c){
  const v=n.trend,td=cell("trend","");td.title=v.text;
  const pts=v.source==="held-out"&&n.heldout?n.heldout.series:smooth(n.series.map(p=>[p[0],p[1]]),10);
  td.innerHTML=spark(pts,c)+`<span class="tr-${v.trend.split(" ")[0]}">${v.trend}</span>`;return td;
}
function drawNodes(nodes){
  const tb=$("nodes").tBodies[0];tb.textContent="";
  nodes.forEach((n,i)=>{const tr=document.createElement("tr");tr.dataset.peer=n.peer;
    const rej=Object.values(n.rejected).reduce((a,b)=>a+b,0),ab=Object.values(n.sync_aborted).reduce((a,b)=>a+b,0);
    const st=cell("status",n.status);st.className="st-"+n.status;const pc=cell("peer",n.peer);
    pc.title=n.join||"accepts no connections (client mode): others join through a node that listens";
    sub(pc,n.model);
    [pc,st,cell("uptime",duration(n.uptime_s)),cell("round",n.round),
     trendCell(n,COLORS[i%COLORS.length]),cell("reward",fmt(n.reward,3)),
     cell("external_reward",fmt(n.external_reward,3)),cell("peers_seen",n.peers_seen),
     cell("groups",n.accepted+" / "+n.used+" / "+rej),cell("fetch_failed",n.fetch_failed),
     cell("dropped_zero_adv",n.dropped_zero_adv),cell("sync",n.sync_committed+" / "+ab+", rev "+n.revision),
     cell("bytes",human(n.bytes_in)+" / "+human(n.bytes_out)),syncCell(n),roundCell(n),
     cell("memory",fmt(n.rss_mb,0)+" / "+fmt(n.children_rss_mb,0)),
     cell("cpu",fmt(n.cpu_s,0)+" / "+fmt(n.children_cpu_s,0)),
     ...heldoutCells(n.heldout)
    ].forEach(td=>tr.appendChild(td));tb.appendChild(tr);});
  const w=$("nodes-wrap"),more=w.scrollWidth>w.clientWidth+1;w.classList.toggle("more",more);
  w.dataset.fits=String(!more);
}
function roundCell(n){
  const td=cell("round_s",fmt(n.round_s,2));
  const k=v=>v==null?"-":v>=1000?(v/1000).toFixed(v>=1e4?0:1)+"k":v.toFixed(0);
  if(n.sample_tokens_per_s!=null){sub(td,k(n.sample_tokens_per_s)+"/"+k(n.train_tokens_per_s));
    td.title="tokens per second: sampling "+fmt(n.sample_tokens_per_s,1)+", training "+fmt(n.train_tokens_per_s,1);}
  return td;
}
function syncCell(n){
  const s=n.last_sync;if(!s)return cell("last_sync","-");
  const what=s.result+(s.cause?" ("+s.cause+")":"")+", "+(s.group_size??"-")+" peers, "+fmt(s.sync_s,1)+" s, "
    +ago(s.age_s);
  const c=cell("last_sync",what),sus=Object.entries(s.suspects||{});c.className="wrap";
  c.title="catch-ups: "+n.catch_ups+(sus.length?"\nsuspects: "+sus.map(([p,r])=>p+" "+r).join(", "):"");
  if(sus.length)c.textContent+=", "+sus.length+" suspect"+(sus.length>1?"s":"");
  return c;
}
function drawPeers(nodes){
  const tb=$("peers").tBodies[0];tb.textContent="";
  for(const n of nodes)for(const p of (n.peers||[])){const tr=document.createElement("tr");tr.dataset.publisher=p.peer;
    [cell("node",n.peer),cell("peer",p.peer),cell("age",ago(p.age_s)),cell("round",p.round),cell("batches",p.batches),
     cell("used",p.used),cell("refused",p.refused)].forEach(td=>tr.appendChild(td));tb.appendChild(tr);}
  if(!tb.rows.length){const tr=document.createElement("tr");tr.appendChild(cell("none","no peer yet"));
    tb.appendChild(tr);}
}
function drawReasons(nodes){
  const rows={},add=(k,c)=>{if(c)rows[k]=(rows[k]||0)+c;};
  for(const n of nodes){
    for(const [r,c] of Object.entries(n.rejected))add("trust|"+r,c);
    for(const [r,c] of Object.entries(n.sync_aborted))add("sync aborted|"+r,c);
    add("availability|fetch failed",n.fetch_failed);add("no signal|all rewards equal (see below)",n.dropped_zero_adv);}
  const tb=$("reasons").tBodies[0];tb.textContent="";const keys=Object.keys(rows).sort();
  if(!keys.length){const tr=document.createElement("tr");tr.appendChild(cell("none","none"));
    tb.appendChild(tr);}
  for(const k of keys){const [kind,r]=k.split("|");const tr=document.createElement("tr");
    [cell("reason",r),cell("kind",kind),cell("count",rows[k])].forEach(td=>tr.appendChild(td));tb.appendChild(tr);}
}
function drawHeldout(nodes){
  const shown=nodes.filter(n=>n.heldout);$("heldout").hidden=!shown.length;if(!shown.length)return;
  let maxX=1;const lines=[];
  nodes.forEach((n,i)=>{if(!n.heldout)return;
    for(const [x] of n.heldout.series)maxX=Math.max(maxX,x);
    lines.push([n.heldout.series,COLORS[i%COLORS.length],""]);});
  plot($("heldout-chart"),200,lines,maxX,0,1,true);
  const fams=[...new Set(shown.flatMap(n=>Object.keys(n.heldout.per_family)))].sort();
  const t=$("heldout-families"),head=document.createElement("tr");
  for(const k of ["peer","round","all",...fams]){const th=document.createElement("th");th.textContent=k;
    head.appendChild(th);}
  t.tHead.textContent="";t.tHead.appendChild(head);t.tBodies[0].textContent="";
  for(const n of shown){const h=n.heldout,tr=document.createElement("tr");tr.dataset.heldoutPeer=n.peer;
    [cell("peer",n.peer),cell("round",h.round),cell("accuracy",fmt(h.accuracy,3)),
     ...fams.map(f=>cell("family-"+f,fmt(h.per_family[f],3)))].forEach(td=>tr.appendChild(td));
    t.tBodies[0].appendChild(tr);}
}
function drawHeldoutCard(t){
  const none=t.heldout_accuracy===null;$("t-heldout").textContent=fmt(t.heldout_accuracy,3);
  $("t-heldout-first").textContent=none?"none yet: --eval-every N turns it on":
    "from "+fmt(t.heldout_first_accuracy,3)+", mean of "+t.heldout_nodes+(t.heldout_nodes===1?" node":" nodes");
}
function render(d){
  const t=d.totals;document.title="swarm-node: "+d.title;$("title").textContent=d.title;
  $("t-nodes").textContent=t.running+" / "+t.nodes;$("t-rounds").textContent=t.rounds;
  $("t-peers").textContent=t.peers_seen;
  $("t-groups").textContent=t.accepted+" / "+t.used;$("t-rejected").textContent=t.rejected;
  $("t-sync").textContent=t.sync_committed+" / "+t.sync_aborted;$("t-revision").textContent=t.revision;
  $("t-bytes").textContent=human(t.bytes_in)+" / "+human(t.bytes_out);
  $("version").textContent="swarm-node "+d.version;$("verdict").textContent=t.verdict;
  $("join").textContent=t.join||(d.nodes.length?
    "no node here accepts connections (client mode): join through a node that listens":"-");
  const up=d.nodes.map(n=>n.uptime_s).filter(u=>u!==null);
  $("uptime").textContent=up.length?duration(Math.max(...up)):"-";
  drawHeldoutCard(t);drawChart(d.nodes);drawNodes(d.nodes);drawPeers(d.nodes);drawReasons(d.nodes);drawHeldout(d.nodes);
  $("updated").textContent="live, updated "+new Date(d.time*1000).toLocaleTimeString();
}
async function poll(){
  try{const r=await fetch("api/summary",{cache:"no-store"});render(await r.json());}
  catch(e){$("updated").textContent="disconnected: retrying";}
  setTimeout(poll,2000);
}
poll();
</script></body></html>
"""
