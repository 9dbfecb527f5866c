# vramlab report: gnuplot speedup.gp in this folder re-renders speedup.png
if (!exists("vl_png")) vl_png = 'speedup.png'
set terminal png size 1000,600 noenhanced
set output vl_png
set title 'Speedup vs ranks: samples/s against 1 card at the same per-card batch (measured: CPU ranks, median)'
set xlabel 'ranks (cards)'
set ylabel 'speedup'
set grid
set key left top
set xrange [0.8:8.5]
set yrange [0:8.5]
set xtics (1, 2, 4, 8)
plot x with lines lc rgb 'gray' title 'ideal (= ranks)', 'speedup.dat' index 0 using 1:2 with points pt 9 ps 2 lc rgb 'black' title 'article (004): 1.9x, 3.8x', 'speedup.dat' index 1 using 1:2 with linespoints lw 2 dt 2 title 'modeled dp: PCIe, RTX 4090', 'speedup.dat' index 2 using 1:2 with linespoints lw 2 dt 2 title 'modeled ddp: PCIe, RTX 4090', 'speedup.dat' index 3 using 1:2 with linespoints lw 2 dt 2 title 'modeled ddp-tuned: PCIe, RTX 4090', '' index 3 using 1:3 with linespoints lw 2 dt 3 title 'modeled ddp-tuned: NVLink, H100', 'speedup.dat' index 4 using 1:2 with linespoints lw 2 dt 2 title 'modeled zero1: PCIe, RTX 4090', 'speedup.dat' index 5 using 1:2 with points pt 5 ps 1.6 title 'measured here: single', 'speedup.dat' index 6 using 1:2 with points pt 7 ps 1.6 title 'measured here: dp', 'speedup.dat' index 7 using 1:2 with points pt 11 ps 1.6 title 'measured here: ddp', 'speedup.dat' index 8 using 1:2 with points pt 13 ps 1.6 title 'measured here: ddp-tuned', 'speedup.dat' index 9 using 1:2 with points pt 15 ps 1.6 title 'measured here: zero1'
