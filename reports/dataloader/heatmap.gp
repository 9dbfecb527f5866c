# vramlab report: gnuplot heatmap.gp in this folder re-renders heatmap.png
if (!exists("vl_png")) vl_png = 'heatmap.png'
set terminal png size 800,520 noenhanced
set output vl_png
set title 'Pipeline throughput (images/s), workers x prefetch, no consumer'
set xlabel 'num_workers'
set ylabel 'prefetch_factor'
set logscale y 2
set palette defined (0 '#f7fbff', 1 '#6baed6', 2 '#08306b')
set cblabel 'images/s'
set offsets 0.5, 0.5, 0, 0
set xtics 1
set yrange [0.7:5.7]
plot 'sweep.dat' using 1:2:3 with points pt 5 ps 6 palette notitle, '' using 1:2:(sprintf('%.0f', $3)) with labels tc rgb 'black' font ',9' offset 0,-1.6 notitle
