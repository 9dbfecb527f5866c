# vramlab report: gnuplot workers.gp in this folder re-renders workers.png
if (!exists("vl_png")) vl_png = 'workers.png'
set terminal png size 800,480 noenhanced
set output vl_png
set title 'Throughput vs workers (best prefetch) and the decode-only ceiling (2 cores)'
set xlabel 'num_workers'
set ylabel 'images/s (measured on this CPU)'
set xtics 1
set mxtics 1
set grid
set key bottom right
set yrange [0:*]
plot 'workers.dat' using 1:2 with linespoints lw 2 pt 7 title 'pipeline', '' using 1:3 with lines lw 2 dt 2 lc rgb 'red' title 'decode ceiling x min(workers, cores)'
