# vramlab report: gnuplot busbw.gp in this folder re-renders busbw.png
if (!exists("vl_png")) vl_png = 'busbw.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Bus bandwidth vs size (out of place, measured here over MPI)'
set xlabel 'bytes'
set ylabel 'busbw GB/s'
set logscale x 2
set format x '%.0s%cB'
set grid
set key left top
plot 'busbw.dat' index 0 using 1:2 with linespoints lw 2 title 'allreduce', 'busbw.dat' index 1 using 1:2 with linespoints lw 2 title 'reduce_scatter', 'busbw.dat' index 2 using 1:2 with linespoints lw 2 title 'allgather'
