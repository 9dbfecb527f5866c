# vramlab report: gnuplot load.gp in this folder re-renders load.png
if (!exists("vl_png")) vl_png = 'load.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Time per batch: the input pipeline alone, and U-Net inputs on this CPU (run scale)'
set ylabel 'ms per batch (log scale)'
set logscale y
set grid y
set xtics rotate by -30
set boxwidth 0.35
set style fill solid 0.8 border -1
set key outside below
plot 'load.dat' using ($1-0.18):3:xtic(2) with boxes lc rgb '#377eb8' title 'load (pipeline alone)', '' using ($1+0.18):4 with boxes lc rgb '#e41a1c' title 'U-Net inputs on this CPU (uncached: + the encoders)'
