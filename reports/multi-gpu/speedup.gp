# vramlab report: gnuplot speedup.gp in this folder re-renders speedup.png
if (!exists("vl_png")) vl_png = 'speedup.png'
set terminal png size 1400,620 noenhanced
set output vl_png
set multiplot layout 1,2 title 'Speedup: samples/s against 1 card at the same per-card batch'
set grid
set ylabel 'speedup'
set title 'measured here: 2 CPU ranks of one thread (stand-ins for 2 cards), run scale'
set xlabel 'rung (2 ranks)'
set xrange [0.5:4.5]
set xtics ('dp' 1, 'ddp' 2, 'ddp-tuned' 3, 'zero1' 4)
set yrange [1:2.1]
set key left bottom
plot 2 with lines lw 6 lc rgb '#dddddd' title 'ideal (2)', 1.9 with lines dt 2 lw 2 lc rgb 'black' title 'article (004): 1.9x', 'speedup.dat' index 1 using 1:2:3:4 with yerrorbars pt 7 ps 1.5 lw 2 lc rgb '#1f77b4' title 'measured: median, min-max of the repetitions'
set title 'modeled at full scale (assumed rates, see the modeled section)'
set xlabel 'cards'
set xrange [0.8:8.5]
set yrange [0:8.5]
set xtics (1, 2, 4, 8)
set key right bottom
plot x with lines lw 8 lc rgb '#dddddd' title 'ideal (= cards)', 'speedup.dat' index 0 using 1:2 with points pt 9 ps 2 lc rgb 'black' title 'article (004): 1.9x, 3.8x', 'speedup.dat' index 2 using 1:2 with linespoints lw 2 pt 5 lc rgb '#d62728' title 'modeled dp: PCIe, RTX 4090', 'speedup.dat' index 3 using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'modeled ddp: PCIe, RTX 4090', 'speedup.dat' index 4 using 1:2 with linespoints lw 2 pt 9 lc rgb '#9467bd' title 'modeled ddp-tuned: PCIe, RTX 4090 (on the ideal line)', '' index 4 using 1:3 with linespoints lw 2 dt 3 pt 8 lc rgb '#9467bd' title 'modeled ddp-tuned: NVLink, H100', 'speedup.dat' index 5 using 1:2 with linespoints lw 2 pt 11 lc rgb '#ff7f0e' title 'modeled zero1: PCIe, RTX 4090'
unset multiplot
