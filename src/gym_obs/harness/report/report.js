// gym-obs report: inlined into report.html by page.py. It only fills elements with textContent.
(function(){
  'use strict';
  function cell(row,text){var td=document.createElement('td');td.textContent=text;row.appendChild(td);}
  function show(svg,index,g){
    var box=svg.closest('.trace'),panel=box.querySelector('.span-detail');
    if(!svg._spans){svg._spans=JSON.parse(box.querySelector('script.span-data').textContent);}
    var span=svg._spans[index];if(!span)return;
    box.querySelectorAll('.span-row.selected').forEach(function(n){n.classList.remove('selected');});
    g.classList.add('selected');
    panel.textContent='';var h=document.createElement('strong');h.textContent=span.service+' · '+span.name+' ('+span.kind+', '+span.duration_ms+' ms, '+span.status+')';panel.appendChild(h);
    var table=document.createElement('table');
    var base={span_id:span.span_id,parent_span_id:span.parent_span_id,status_message:span.status_message};
    [base,span.attributes].forEach(function(obj){Object.keys(obj).forEach(function(k){var tr=document.createElement('tr');cell(tr,k);cell(tr,String(obj[k]));table.appendChild(tr);});});
    span.events.forEach(function(ev){Object.keys(ev.attributes).forEach(function(k){var tr=document.createElement('tr');cell(tr,'event '+ev.name+': '+k);cell(tr,String(ev.attributes[k]));table.appendChild(tr);});});
    panel.appendChild(table);panel.hidden=false;
  }
  document.addEventListener('click',function(e){
    var g=e.target.closest&&e.target.closest('.span-row');if(!g)return;
    show(g.closest('svg'),Number(g.getAttribute('data-span')),g);
  });
  document.addEventListener('keydown',function(e){
    if(e.key!=='Enter')return;var g=e.target.closest&&e.target.closest('.span-row');if(g){show(g.closest('svg'),Number(g.getAttribute('data-span')),g);}
  });
  document.body.setAttribute('data-report-ready','1');
})();
